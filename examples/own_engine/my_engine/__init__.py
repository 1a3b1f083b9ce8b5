"""A minimal third-party engine that uses tokenstate's contracts without tokenstate's runner."""
