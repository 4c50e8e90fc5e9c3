"""Records: what a run wrote and how to read it. The schema, the files (atomic writes, loading),
the environment a run captures, its provenance, the run's own record writer, and the functions
that describe a record for report, project and compare alike. No torch at import."""
