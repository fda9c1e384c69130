"""The write actions shared by the API and the CLI, one transaction each."""
