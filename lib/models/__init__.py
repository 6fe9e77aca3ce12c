"""The transformer (a pure nn module), task models on it, model folders, Hugging Face import and export."""
