package main

import "errors"

func runDemo(args []string) error { return errors.New("not implemented yet") }
