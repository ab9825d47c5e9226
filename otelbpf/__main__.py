import sys

from otelbpf.cli import main

sys.exit(main())
