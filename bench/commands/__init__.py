"""One module per `bench X`, each with ``add_parser(sub, help)`` and ``main(args,
passed_on)``; bench.cli names them."""
