from trainsim.cli import main

main()
