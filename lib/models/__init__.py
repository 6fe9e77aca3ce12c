"""The models (pure nn modules): their config, building blocks, architectures by name, model families, model folders, Hugging Face import and export."""
