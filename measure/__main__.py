import sys

from measure.cli import main

sys.exit(main())
