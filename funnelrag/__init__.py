"""funnelrag: offline corpus build and training pipeline for progressive RAG."""
__version__ = "0.1.0"
