"""Using a trained task model: prediction in Python and as an MLflow model, ONNX export."""
