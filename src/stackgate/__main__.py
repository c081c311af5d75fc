from stackgate.cli import main

raise SystemExit(main())
