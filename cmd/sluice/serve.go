package main

import "errors"

func runServe(args []string) error { return errors.New("not implemented yet") }
