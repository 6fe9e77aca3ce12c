"""Using a trained model: prediction in Python and as an MLflow model, ONNX export, the model card every
model folder carries, and upload to the Hugging Face hub."""
