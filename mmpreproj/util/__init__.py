"""Leaf helpers the other layers share, importing nothing else of the package: atomic file writes and modes
(`io`), several files replaced together (`file_sets`), JSON dataclass configs (`jsonconfig`), field checks with
one-line errors (`validate`), and eval mode on a forked RNG for a probe forward (`probing`)."""
