import sys

from nodeagent.cli.main import main

sys.exit(main())
