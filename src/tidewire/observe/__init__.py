"""What operators see: metrics (:mod:`.metrics`) and log lines (:mod:`.logs`)."""
