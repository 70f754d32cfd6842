"""Scale-out: data-parallel engine replicas (local processes or Ray actors) behind one
prefix-aware router. Depends on engine/; nothing below it imports this package."""
