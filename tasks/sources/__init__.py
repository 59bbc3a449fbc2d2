"""Where the corpus comes from: dump readers and the ingest stage (``ingest``), the Wikimedia dumps
mirror (``dump_source``), adds-changes days (``adds_changes``) and tonight's plan (``nightly``).
Imports no corpus stage: the corpus build reads what it writes."""
