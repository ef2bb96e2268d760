from mlops.cli import main

main()
