import sys

from nemo_convert.cli.main import main

sys.exit(main())
