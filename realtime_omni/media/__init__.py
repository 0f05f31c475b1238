"""Audio signal processing with no protocol in it: G.711 and resampling. The lowest layer: it
imports nothing of the project, and every other layer (pipelines included) may import it."""
