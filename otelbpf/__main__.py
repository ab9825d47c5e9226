import sys

from otelbpf.cli.main import main

sys.exit(main())
