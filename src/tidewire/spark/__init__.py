"""The PySpark data source (format ``tidewire``)."""
