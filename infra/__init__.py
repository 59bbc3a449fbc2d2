"""Deployment and training infrastructure configs (accelerate, DeepSpeed, servers)."""
