"""Torch modules of funnelrag: plain ``nn.Module``s built from config dataclasses."""
