"""Finetuning task types beyond sequence classification (issue 19): each module reads, encodes, batches, scores."""
