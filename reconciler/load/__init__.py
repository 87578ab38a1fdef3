"""Loading the operator's files into the model: the loader, secrets, the JSON Schemas of the files."""
