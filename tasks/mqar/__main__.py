from .task import main

main()
