import sys

from gpu_runtime.cli import main

sys.exit(main())
