import sys

from nanscope.cli import main

sys.exit(main())
