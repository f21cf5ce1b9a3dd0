import sys

from shardcheck.cli import main

sys.exit(main())
