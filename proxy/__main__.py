from proxy.cli import main

main()
