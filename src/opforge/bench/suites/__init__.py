"""The model suite (``opforge bench --suite model``): a whole decoder, against its peers."""
