"""The local inference engine: EAGLE draft head, dynamic draft trees, exact verification."""
