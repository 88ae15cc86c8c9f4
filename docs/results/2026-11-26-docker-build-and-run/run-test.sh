set -euo pipefail
cd /tmp/fresh
# A Docker engine for tests/docker/test_image.py (the image built and run): started here when none answers, and
# stopped when this script ends. Where it cannot start (no privileges), that test skips and says why.
started_dockerd=""
stop_dockerd() {
  if [ -n "$started_dockerd" ] && kill -0 "$started_dockerd" 2>/dev/null; then
    kill -TERM "$started_dockerd" && wait "$started_dockerd" || true
    echo "ci: stopped the dockerd it started (pid $started_dockerd)"
  fi
}
if ! docker info >/dev/null 2>&1; then
  dockerd_log="$(mktemp "${TMPDIR:-/tmp}/ci-dockerd.XXXXXX.log")"
  dockerd >"$dockerd_log" 2>&1 &
  started_dockerd=$!
  trap stop_dockerd EXIT
  for _ in $(seq 60); do
    if docker info >/dev/null 2>&1 || ! kill -0 "$started_dockerd" 2>/dev/null; then break; fi
    sleep 1
  done
  if docker info >/dev/null 2>&1; then
    echo "ci: started dockerd (pid $started_dockerd, log $dockerd_log)"
  else
    echo "ci: dockerd did not start ($(tail -n 1 "$dockerd_log")): the Docker image tests will skip"
  fi
fi

start=$SECONDS
/work/main/.venv/bin/python -m pytest -v -rs -s -p no:cacheprovider tests/docker/test_image.py || status=$?
echo "pytest took $((SECONDS - start)) s, status ${status:-0}"
exit ${status:-0}
