import sys

from nodeagent.cli.entry import main

sys.exit(main())
