"""Stock SGLang's sampling distribution and exact rejection sampling of drafts against it."""
