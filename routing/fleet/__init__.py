"""The fleet the router picks from: endpoints, their live load and request lifecycle, topology domains."""
