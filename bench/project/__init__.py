"""`bench project`'s model: the scaling model (scaling), how records feed it (from_records),
and its plot (plot). Reads records only; no torch at import."""
