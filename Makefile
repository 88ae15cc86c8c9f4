# Two commands for a fresh machine:
#   make run   set up .venv, export $(ARCH) (+ model-store/$(ARCH).mar), serve it, send one curl, stop
#   make test  set up .venv and run every test (slow end-to-end ones included; the venv has every extra, Ray too)
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
ARCH ?= resnet50
WEIGHTS ?= auto
PORT ?= 8080

.PHONY: setup run export serve test test-fast bench bench-inprocess gpu-check clean litert-env

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[serving,dev,ray,openvino,executorch]'
	# MTCNN's trained face detector (models/mtcnn.py): only its data files are used; its metadata pins torch<2.3
	$(PY) -m pip install --quiet --no-deps facenet-pytorch==2.6.0
	touch $@

setup: $(VENV)/.installed

# LiteRT's converter in an environment of its own: litert-torch's pins would downgrade .venv's typing_extensions and
# pydantic (the serving stack's). Its packages come first; a .pth adds .venv's site-packages after them (with their
# own .pth files), so torch and the rest are not installed twice. Then: .venv-litert/bin/python -m export ...
LITERT_VENV ?= .venv-litert
$(LITERT_VENV)/.installed: $(VENV)/.installed pyproject.toml
	$(PY) -m venv $(LITERT_VENV)
	echo '*' > $(LITERT_VENV)/.gitignore
	main=$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))'); \
	own=$$($(LITERT_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))'); \
	echo "import site; site.addsitedir('$$main')" > "$$own/layered-over-main-venv.pth"
	$(LITERT_VENV)/bin/python -m pip install --quiet -e '.[litert]'
	touch $@

litert-env: $(LITERT_VENV)/.installed

export: setup
	$(PY) -m export resnet --arch $(ARCH) --weights $(WEIGHTS)

# The whole path: export -> serve -> one prediction with curl -> stop (also when curl fails).
run: export
	$(PY) -m serving --detach --models $(ARCH) --inference-port $(PORT)
	trap '$(PY) -m serving stop' EXIT; \
	curl -sS --fail-with-body -X POST http://127.0.0.1:$(PORT)/predictions/$(ARCH) \
	     -H "Content-Type: image/jpeg" --data-binary @examples/cat.jpg; status=$$?; echo; exit $$status

serve: setup
	$(PY) -m serving

# Two pytest-xdist workers (a 2-core machine's worth); each test module runs whole on one (tests/conftest.py).
TEST_WORKERS ?= 2
# -rsfE: the summary lists skips, then failures and errors last, where a log cut to its tail still names them.
# Then the litert kind's tests, in the one environment that has litert-torch (in .venv they skip, saying so).
LITERT_TESTS := tests/export/forms/test_litert.py tests/runtime/test_litert.py
test: setup litert-env
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope -v -rsfE --durations=40
	$(LITERT_VENV)/bin/python -m pytest -v -rsfE $(LITERT_TESTS)

test-fast: setup
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope -q -m "not slow"

# Both benchmarks in one run: in-process (every artifact, this machine's GEMM peak), then TorchServe under
# hey for each configuration against the naive baseline; bench-results/{bench,results}.{md,json,png}.
bench: setup
	$(PY) -m measure bench --export-dir artifacts/$(ARCH)

bench-inprocess: setup
	$(PY) -m measure inprocess artifacts/$(ARCH)

# On a CUDA machine, from a plain checkout (no venv needed): export on the GPU, parity, backends,
# in-process GPU benchmark, TorchServe on the GPU. Without CUDA: one line, exit 0.
GPU_OUT ?= gpu-results
gpu-check:
	PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} python3 -m measure gpu-check $(GPU_OUT)

clean:
	rm -rf artifacts model-store .serving bench-results

# The serving image (docker/Dockerfile), as compose.yaml names it: its base pulled, or built from Debian's archive
# where Docker Hub is out of reach; BuildKit; CA_BUNDLE=FILE for pip behind a proxy that re-signs TLS (a build
# secret, in no layer). Then: docker compose --profile cpu up torchserve-cpu. docker/README.md.
.PHONY: docker-build
docker-build:
	docker/build.sh $(if $(CA_BUNDLE),--ca-bundle $(CA_BUNDLE))
