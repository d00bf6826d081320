import sys

from .task import main

sys.argv[0] = "python -m tasks.snli"  # the usage line names the command, not the file
main()
