"""The models (pure nn modules): their config, building blocks, architectures by name, generation with an encoder-decoder, model families, model folders, Hugging Face import and export."""
