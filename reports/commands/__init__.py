"""One module per ``verigrad`` subcommand (``add_arguments`` + ``run``)."""
