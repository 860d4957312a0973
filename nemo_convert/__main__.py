import sys

from nemo_convert.cli.startup import main

sys.exit(main())
