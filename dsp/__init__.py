"""Audio signal processing with no protocol in it: G.711 (g711.py) and resampling (resample.py).
The lowest layer: it imports nothing of the project, and every other package (pipelines included)
may import it."""
