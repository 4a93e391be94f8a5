"""Distilled draft models shipped with specdecode, one folder per target (see specdecode.drafters.distilled)."""
