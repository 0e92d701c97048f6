from nanoplan.cli import main

main()
