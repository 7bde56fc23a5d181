"""hamburger-train: trains a HAMburger on the CPU (see train/README.md and docs/training.md)."""
