"""Tools that know nothing of bench's runs: errors and exit codes, the terminal, statistics,
folders, ports, process lifetimes, quick exit, the standard streams, the fault hooks."""
