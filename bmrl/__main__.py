import sys

from bmrl.cli import main

sys.exit(main())
