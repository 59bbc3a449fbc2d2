"""The FunnelRAG funnel and its training: questions, candidates, FiD reader, Eq. 3 attention, Eq. 4-5 labels, Eq. 6 BPR."""
