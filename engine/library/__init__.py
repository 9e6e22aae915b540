"""The model library: models already on disk (other apps' folders, the Hugging Face cache) and downloads."""
