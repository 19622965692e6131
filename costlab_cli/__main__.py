import sys

from costlab_cli.main import main

sys.exit(main())
