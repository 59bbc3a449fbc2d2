"""R²AG (Ye et al. 2024): retrieval features, ranked lists, QDM training, retrieval-aware prompting."""
