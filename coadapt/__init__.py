"""coadapt: co-adaptive, goodput-optimised deep-learning scheduling."""

__version__ = "0.1.0"
