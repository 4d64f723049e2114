"""Op families. Each sub-package registers its variants with the runtime when imported."""
