"""What only the book computes: each chapter's experiments, figures and explorables."""
