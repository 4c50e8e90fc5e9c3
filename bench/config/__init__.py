"""A run's configuration: the frozen RunConfig and its pieces (run_config) and the options of
`bench run` that make it (options). No torch at import."""
