"""The corpus stages in shards: token counts and segmentation by cluster ranges (``shards``), the
cluster index from token shards (``cluster_index``), the passage index in shards
(``sharded_index``), and the per-document memos they read (``token_memo``, ``segment_memo``).
Calls the pure stages of ``tasks.corpus``; no pure stage imports it."""
